"""The simulated vLLM's response model: how throughput, TTFT, TPOT, boot time and boot failure
depend on the `vllm serve` flags and tpu-inference variables the boot script renders.

Standard library only: the simulator runs as a fake container (`python -S -I`). Figures cite
docs/measurements.md by section ("SPEC n"); every other parameter is SEEDED (`Params.draw`)
and labelled so. Product code never reads this module or a seed (the tuner must find the
optimum by measuring, not by reading the simulator).

Fixed geometry (Gemma 4 E2B on one v5e chip):
  HBM visible 15.75 GiB, weights 8.97 GiB (SPEC 5, measured); KV 18,432 B/token (SPEC 5,
  derived); block = max_model_len / 512, 512 blocks per request (SPEC 4, measured).

1. KV capacity (tokens) = floor((15.75 GiB x u - 8.97 GiB) / 18,432 / block) x block, u the
   --gpu-memory-utilization (or 8.97 GiB + --kv-cache-memory bytes in its place). At 0.92:
   5,021 blocks of 64 = 321,344 tokens (SPEC 5, measured). fp8 KV dtypes give the same
   capacity (1.000x: the word-aligned layout, SPEC 4) and 2% less throughput (SPEC 4, "about
   2%"); plain `fp8` is taken as the same (an ASSUMPTION: SPEC 4 measured the two named
   ones). int8 is refused by the CLI; the dtypes SPEC 4 lists as fatal die at boot; the
   untried ones (float16, fp8_per_token_head, int4_per_token_head) serve as auto (ASSUMED).
   (The engine's 5,021 against the arithmetic's 5,024: the 3.3 MiB difference, from SPEC 4's
   measured-good --kv-cache-memory 5923602432, is held back at every fraction.)
   A max_model_len above the capacity stops the boot after the KV init (vLLM's check).
2. Memory wall: the compiled programs live outside the cap. Their size, 843.2 MiB, is derived
   from SPEC 4's 0.95 failure (15.75 GiB x 0.05 = 806.4 MiB outside the cap, 347.33 MiB free
   when a 384.11 MiB program failed: 806.4 - 347.33 + 384.11). Margin(u) = 15.75 GiB x (1-u)
   - 843.2 MiB - extra program memory - a SEEDED runtime reserve (margin_mib); below zero the
   boot dies while loading jit_structured_decode_fn with SPEC 4's error, at PRE + F x compile
   where F = (691 - 150) / 685: the default program set at 0.95 dies 691 s in (SPEC 4). 0.93
   and 0.94 (margins 285.7 and 124.5 MiB before the reserve; SPEC 4 estimated 291 and 127 MB)
   live or die by the seed. Extra program memory: bucket_mib per token bucket above 9, and
   spec_mib with speculative decoding (both SEEDED).
3. Boot time: PRE 150 s (load, profile, KV init) + compile + POST 22 s. The 150/22 split of
   SPEC 4's 172 non-compile seconds is an ASSUMPTION. Compile = 685 s (SPEC 4, measured, the
   default program set) x (fixed + (1 - fixed) x programs / default programs) / speedup,
   where fixed is SEEDED, programs = token buckets x request buckets (log2(max_num_seqs) - 2),
   speedup = 1 + worker_eff x (min(NUM_PRECOMPILE_WORKERS, worker_cap) - 1) (SEEDED), plus
   spec_compile_s with speculative decoding (SEEDED). A warm boot (the programs already in
   the mounted cache) loads them in 325/685 of the compile time: 150 + 325 + 22 = 497 s
   (SPEC 4, measured warm restart). Cold default: 150 + 685 + 22 = 857 s (SPEC 4).
4. Token buckets: powers of two from 16 up to the padding gap, then steps of the gap, until
   >= --max-num-batched-tokens (vLLM's `_get_paddings`: 16, 512, gap 64 -> 16, 32, 64, 128,
   192, ..., 512); gap 0 is powers of two only (16 ... 4096: 9 buckets, SPEC 4). Below the
   multimodal floor 2496 with --disable-chunked-mm-input the boot stops with SPEC 4's error.
5. Serving (per request; the server paces each stream by it): the default config's TTFT
   median and TPOT at (context c, in-flight n) come from SPEC 6's grid: TTFT as measured,
   TPOT derived from SPEC 6's tok/s by the closed loop tok/s = n x o / (TTFT + (o-1) TPOT) at
   o = 256 output tokens (an ASSUMPTION: SPEC 6 does not state its output length); between
   grid points log-log interpolation, outside it the end slopes. The 8K x 64 cell is past
   the KV wall; its no-wall base is extrapolated from 8K x 4 and 8K x 16, and the wall
   multiplies TTFT and TPOT by 1 + (M0 - 1) x (w - 1) / (w0 - 1) for an overload w = n x (c
   + o) / capacity > 1, M0 and w0 taken from that cell (TTFT x10.1, TPOT x1.55): TTFT
   explodes past the wall, and more capacity (0.93/0.94) moves it.
   Flag factors on top:
   - ladder: a prefill of c tokens takes floor(c/B) steps of the top bucket plus one of the
     remainder's bucket; TTFT x (1 + k (R - 1)), R that work over the default's, k set so
     2496 costs exactly 24.7% of throughput at 8K x 64 (SPEC 4, measured; ITL unchanged);
   - --max-num-batched-tokens 8192: TTFT x b8192_ttft, TPOT x b8192_tpot (SEEDED);
   - VLLM_TPU_BUCKET_PADDING_GAP > 0: TPOT x gap_tpot (SEEDED), more buckets to compile;
   - --max-num-seqs S < 256: TPOT x (1 + seqs_cost x log2(256 / S) / 2), seqs_cost > 0
     (SEEDED size, measured sign: 64 was worse in every cell, SPEC 4); n > S queue: TTFT +
     (n/S - 1) x the request's service time;
   - max_model_len 16384: TPOT x 8.05/8.02 (SPEC 4, measured); 65536: x ml65536_tpot (SEEDED);
   - speculative decoding (any --speculative-config): TPOT / (1 + gain(n)), gain(n) =
     spec_gain - spec_drop x log2(n) / 6 (SEEDED: helps most at one stream, less or harm
     with more);
   - noise: each request's TTFT and TPOT x a normal factor of cv NOISE_CV (1%: SPEC 6's cv
     was at most 1% in most cells, measured).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field

MIB = 1024 * 1024
GIB = 1024 * MIB

# -- anchors (docs/measurements.md)
HBM_VISIBLE = 15.75 * GIB  # SPEC 4/5, measured
WEIGHTS = 8.97 * GIB  # SPEC 5, measured
KV_BYTES_PER_TOKEN = 18_432  # SPEC 5, derived
BLOCKS_PER_REQUEST = 512  # SPEC 4, measured
# What the engine sized at 0.92 (SPEC 4's measured-good --kv-cache-memory, 5,021 blocks of 64)
# against the arithmetic's 5.52 GiB (5,024 blocks): a reserve the sim keeps.
KV_MEASURED_BYTES = 5_923_602_432
KV_RESERVE = HBM_VISIBLE * 0.92 - WEIGHTS - KV_MEASURED_BYTES
FAILED_RESERVE_MIB = 384.11  # SPEC 4: the program that did not fit at 0.95
FREE_AT_FAILURE_MIB = 347.33  # SPEC 4
PROGRAMS_MIB = 0.05 * HBM_VISIBLE / MIB - FREE_AT_FAILURE_MIB + FAILED_RESERVE_MIB  # derived
COLD_BOOT_S, COMPILE_S, WARM_BOOT_S = 857.0, 685.0, 497.0  # SPEC 4, measured
PRE_S, POST_S = 150.0, 22.0  # ASSUMED split of the 172 non-compile seconds
DEATH_S = 691.0  # SPEC 4, measured
FAIL_FRACTION = (DEATH_S - PRE_S) / COMPILE_S
WARM_LOAD_RATIO = (WARM_BOOT_S - PRE_S - POST_S) / COMPILE_S
LADDER_COST_2496 = 0.247  # SPEC 4, measured at 8K x 64
MM_FLOOR = 2496  # SPEC 4, measured
FP8_THROUGHPUT = 0.98  # SPEC 4, "about 2% less"
TPOT_16K = 8.05 / 8.02  # SPEC 4: block 32 vs 64, single-stream TPOT
DEFAULT_SEQS = 256  # SPEC 4
DEFAULT_BUCKETS = 9  # 16 ... 4096
NOISE_CV = 0.01  # SPEC 6
ASSUMED_OUTPUT = 256
FP8 = {"fp8", "fp8_e4m3", "fp8_e5m2"}
# SPEC 4: accepted by the CLI, then fatal at boot (and every turboquant_* value).
FATAL_DTYPES = {"int8_per_token_head", "nvfp4", "fp8_inc", "fp8_ds_mla"}

# SPEC 6 (measured): context -> clients -> value
CONTEXTS = (128, 1024, 8192)
CLIENTS = (1, 4, 16, 64)
SPEC6_TOK_S = {128: (123.7, 433.9, 1152.5, 1496.5), 1024: (120.4, 415.4, 991.0, 1258.7),
               8192: (94.2, 254.4, 399.6, 324.3)}
SPEC6_TTFT_MS = {128: (15.9, 31.8, 98.8, 247.3), 1024: (40.3, 51.5, 170.1, 421.7),
                 8192: (289.4, 304.2, 594.4, 11734.0)}


def _tpot_ms(c: int, i: int) -> float:
    n = CLIENTS[i]
    span = n * ASSUMED_OUTPUT / SPEC6_TOK_S[c][i]
    return (span - SPEC6_TTFT_MS[c][i] / 1000) / (ASSUMED_OUTPUT - 1) * 1000


def _extrapolate(a: float, b: float) -> float:
    """The value at 64 clients from those at 4 and 16 (log-log)."""
    return b * (b / a)


SPEC6_TPOT_MS = {c: tuple(_tpot_ms(c, i) for i in range(4)) for c in CONTEXTS}
# The no-wall base of 8K x 64 and the wall that SPEC 6's cell shows.
BASE_TTFT = {c: list(v) for c, v in SPEC6_TTFT_MS.items()}
BASE_TPOT = {c: list(v) for c, v in SPEC6_TPOT_MS.items()}
BASE_TTFT[8192][3] = _extrapolate(SPEC6_TTFT_MS[8192][1], SPEC6_TTFT_MS[8192][2])
BASE_TPOT[8192][3] = _extrapolate(SPEC6_TPOT_MS[8192][1], SPEC6_TPOT_MS[8192][2])
WALL_TTFT = SPEC6_TTFT_MS[8192][3] / BASE_TTFT[8192][3]
WALL_TPOT = SPEC6_TPOT_MS[8192][3] / BASE_TPOT[8192][3]


@dataclass(frozen=True)
class Config:
    """What the simulator reads from `vllm serve ARGS` and the container's environment."""

    max_model_len: int = 32768
    max_num_batched_tokens: int = 4096  # absent: SPEC 4's value (an assumption of the sim)
    max_num_seqs: int = DEFAULT_SEQS
    gpu_memory_utilization: float = 0.92
    kv_cache_memory_bytes: int | None = None
    kv_cache_dtype: str = "auto"
    speculative: dict | None = None
    chunked_mm_disabled: bool = False
    mm_items: int = 0
    padding_gap: int = 0
    precompile_workers: int = 1
    model: str = "google/gemma-4-E2B-it"

    @classmethod
    def parse(cls, argv: list[str], env: dict[str, str]) -> Config:
        """`vllm serve MODEL --flag value ...`; flags it does not model are ignored."""
        args = argv[2:] if argv[:2] == ["vllm", "serve"] else argv
        values: dict[str, str] = {}
        switches: set[str] = set()
        i = 1
        while i < len(args):
            a = args[i]
            if a.startswith("--"):
                flag, eq, inline = a.partition("=")
                if eq:
                    values[flag] = inline
                elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                    values[flag] = args[i + 1]
                    i += 1
                else:
                    switches.add(flag)
            i += 1
        mm = json.loads(values.get("--limit-mm-per-prompt", "{}") or "{}")
        spec = values.get("--speculative-config")
        kv_bytes = values.get("--kv-cache-memory")
        return cls(
            max_model_len=int(values.get("--max-model-len", 32768)),
            max_num_batched_tokens=int(values.get("--max-num-batched-tokens", 4096)),
            max_num_seqs=int(values.get("--max-num-seqs", DEFAULT_SEQS)),
            gpu_memory_utilization=float(values.get("--gpu-memory-utilization", 0.92)),
            kv_cache_memory_bytes=int(kv_bytes) if kv_bytes else None,
            kv_cache_dtype=values.get("--kv-cache-dtype", "auto"),
            speculative=json.loads(spec) if spec else None,
            chunked_mm_disabled="--disable-chunked-mm-input" in switches,
            mm_items=sum(int(v) for v in mm.values()) if isinstance(mm, dict) else 0,
            padding_gap=int(env.get("VLLM_TPU_BUCKET_PADDING_GAP", "0") or 0),
            precompile_workers=int(env.get("NUM_PRECOMPILE_WORKERS", "1") or 1),
            model=args[0] if args else "",
        )

    def program_key(self) -> str:
        """What changes the compiled program set (the cache files the simulator writes)."""
        import hashlib

        material = [self.max_model_len, self.max_num_batched_tokens, self.max_num_seqs,
                    self.kv_cache_dtype, self.speculative, self.padding_gap, self.model]
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Params:
    """The SEEDED parameters (everything docs/measurements.md does not pin)."""

    seed: int
    margin_mib: float  # runtime reserve outside the cap: decides 0.93 / 0.94
    bucket_mib: float  # program memory per token bucket above the default 9
    compile_fixed: float  # share of the compile that does not scale with the program set
    worker_eff: float
    worker_cap: int
    gap_tpot: float
    b8192_ttft: float
    b8192_tpot: float
    ml65536_tpot: float
    seqs_cost: float  # > 0: SPEC 4's sign
    spec_gain: float
    spec_drop: float  # the gain lost per doubling of concurrency, / 6
    spec_compile_s: float
    spec_mib: float

    @classmethod
    def draw(cls, seed: int) -> Params:
        r = random.Random(seed)
        return cls(
            seed=seed,
            margin_mib=r.uniform(0, 320),
            bucket_mib=r.uniform(1, 6),
            compile_fixed=r.uniform(0.2, 0.6),
            worker_eff=r.uniform(0.2, 0.9),
            worker_cap=r.choice((2, 3, 4, 6, 8)),
            gap_tpot=r.uniform(0.92, 1.03),
            b8192_ttft=r.uniform(0.7, 1.2),
            b8192_tpot=r.uniform(0.97, 1.08),
            ml65536_tpot=r.uniform(0.95, 1.06),
            seqs_cost=r.uniform(0.02, 0.12),
            spec_gain=r.uniform(-0.05, 0.45),
            spec_drop=r.uniform(0.05, 0.5),
            spec_compile_s=r.uniform(30, 150),
            spec_mib=r.uniform(20, 100),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


# ---------------------------------------------------------------- geometry and boot
def token_buckets(max_tokens: int, gap: int) -> list[int]:
    """vLLM's TPU token paddings: powers of two from 16 up to `gap`, then steps of `gap`."""
    out, b = [], 16
    while True:
        out.append(b)
        if b >= max_tokens:
            return out
        b = b * 2 if gap <= 0 or b < gap else b + gap


def bucket_of(tokens: int, buckets: list[int]) -> int:
    return next((b for b in buckets if b >= tokens), buckets[-1])


def block_size(cfg: Config) -> int:
    return max(16, cfg.max_model_len // BLOCKS_PER_REQUEST)


def utilization(cfg: Config) -> float:
    if cfg.kv_cache_memory_bytes is not None:
        return (WEIGHTS + cfg.kv_cache_memory_bytes) / HBM_VISIBLE
    return cfg.gpu_memory_utilization


def kv_blocks(cfg: Config) -> int:
    kv_bytes = (cfg.kv_cache_memory_bytes if cfg.kv_cache_memory_bytes is not None
                else HBM_VISIBLE * cfg.gpu_memory_utilization - WEIGHTS - KV_RESERVE)
    # fp8: a float8 tensor in a word-aligned layout, the same blocks (SPEC 4): 1.000x.
    return max(0, int(kv_bytes / KV_BYTES_PER_TOKEN / block_size(cfg)))


def kv_tokens(cfg: Config) -> int:
    return kv_blocks(cfg) * block_size(cfg)


def programs(cfg: Config) -> float:
    buckets = len(token_buckets(cfg.max_num_batched_tokens, cfg.padding_gap))
    requests = max(1.0, math.log2(max(cfg.max_num_seqs, 2)) - 2)
    return buckets * requests


DEFAULT_PROGRAMS = DEFAULT_BUCKETS * (math.log2(DEFAULT_SEQS) - 2)


def compile_s(cfg: Config, p: Params) -> float:
    share = p.compile_fixed + (1 - p.compile_fixed) * programs(cfg) / DEFAULT_PROGRAMS
    workers = min(max(cfg.precompile_workers, 1), p.worker_cap)
    speedup = 1 + p.worker_eff * (workers - 1)
    extra = p.spec_compile_s if cfg.speculative else 0.0
    return COMPILE_S * share / speedup + extra


def margin_mib(cfg: Config, p: Params) -> float:
    """HBM left outside the cap once every program is loaded (< 0: the boot dies)."""
    buckets = len(token_buckets(cfg.max_num_batched_tokens, cfg.padding_gap))
    extra = max(0, buckets - DEFAULT_BUCKETS) * p.bucket_mib + (
        p.spec_mib if cfg.speculative else 0.0)
    outside = HBM_VISIBLE * (1 - utilization(cfg)) / MIB
    return outside - PROGRAMS_MIB - extra - p.margin_mib


@dataclass(frozen=True)
class Boot:
    """A boot's timeline in simulated seconds: `ready_s` when it serves, or `dies_s` and
    `error` when it fails (the log line vLLM prints)."""

    warm: bool
    compile_s: float  # compiling (cold) or loading the cache (warm)
    ready_s: float | None = None
    dies_s: float | None = None
    error: str | None = None
    kv_tokens: int = 0
    events: list[tuple[float, str]] = field(default_factory=list)


def boot(cfg: Config, p: Params, *, warm: bool) -> Boot:
    c = compile_s(cfg, p) * (WARM_LOAD_RATIO if warm else 1.0)
    kv = kv_tokens(cfg)
    if cfg.kv_cache_dtype == "int8":
        return Boot(warm, 0.0, dies_s=2.0, error="vllm: error: argument --kv-cache-dtype: "
                    "invalid choice: 'int8'")
    if (cfg.chunked_mm_disabled and cfg.mm_items
            and cfg.max_num_batched_tokens < MM_FLOOR):
        return Boot(warm, 0.0, dies_s=20.0, error=(
            "ValueError: Chunked MM input disabled but max_tokens_per_mm_item (2496) is larger "
            f"than max_num_batched_tokens ({cfg.max_num_batched_tokens}). Please increase "
            "max_num_batched_tokens."))
    if cfg.kv_cache_dtype in FATAL_DTYPES or cfg.kv_cache_dtype.startswith("turboquant_"):
        return Boot(warm, 0.0, dies_s=PRE_S, error=(
            f"RuntimeError: kv_cache_dtype {cfg.kv_cache_dtype} is not supported on this path"))
    if cfg.max_model_len > kv:
        return Boot(warm, 0.0, dies_s=PRE_S, kv_tokens=kv, error=(
            f"ValueError: To serve at least one request with the models's max seq len "
            f"({cfg.max_model_len}), ({cfg.max_model_len * KV_BYTES_PER_TOKEN / GIB:.2f} GiB "
            f"KV cache is needed, which is larger than the available KV cache memory "
            f"({kv * KV_BYTES_PER_TOKEN / GIB:.2f} GiB). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine."))
    m = margin_mib(cfg, p)
    if m < 0:
        free = FAILED_RESERVE_MIB + m
        return Boot(warm, c, dies_s=PRE_S + FAIL_FRACTION * c, kv_tokens=kv, error=(
            f"RuntimeProgramAllocationFailure: Attempting to reserve {FAILED_RESERVE_MIB:.2f}M "
            f"at the bottom of memory. That was not possible. There are {max(free, 0):.2f}M "
            f"free, 0B reserved, and {max(free, 0):.2f}M reservable."))
    return Boot(warm, c, ready_s=PRE_S + c + POST_S, kv_tokens=kv)


# ---------------------------------------------------------------- serving
def _interp(table: dict[int, list[float]], c: float, n: float) -> float:
    """Log-log interpolation over SPEC 6's grid, the end slopes outside it."""
    def along(xs: tuple[int, ...], ys: list[float], x: float) -> float:
        lx = math.log(max(x, 1e-9))
        i = 0 if lx <= math.log(xs[1]) else len(xs) - 2
        for j in range(len(xs) - 1):
            if math.log(xs[j]) <= lx <= math.log(xs[j + 1]):
                i = j
                break
        x0, x1 = math.log(xs[i]), math.log(xs[i + 1])
        y0, y1 = math.log(ys[i]), math.log(ys[i + 1])
        return math.exp(y0 + (y1 - y0) * (lx - x0) / (x1 - x0))

    by_context = [along(CLIENTS, table[ctx], n) for ctx in CONTEXTS]
    return along(CONTEXTS, by_context, c)


def prefill_work(context: int, max_tokens: int, gap: int) -> int:
    buckets = token_buckets(max_tokens, gap)
    full, rest = divmod(context, max_tokens)
    return full * buckets[-1] + (bucket_of(rest, buckets) if rest else 0)


_WALL_W0 = CLIENTS[3] * (8192 + ASSUMED_OUTPUT) / kv_tokens(Config())
_R_2496 = prefill_work(8192, 2496, 0) / prefill_work(8192, 4096, 0)


def _ladder_k() -> float:
    """k such that 2496 costs exactly 24.7% of throughput at 8K x 64 (SPEC 4)."""
    ttft, tpot = SPEC6_TTFT_MS[8192][3] / 1000, SPEC6_TPOT_MS[8192][3] / 1000
    span = ttft + (ASSUMED_OUTPUT - 1) * tpot
    ttft_needed = span / (1 - LADDER_COST_2496) - (ASSUMED_OUTPUT - 1) * tpot
    return (ttft_needed / ttft - 1) / (_R_2496 - 1)


LADDER_K = _ladder_k()


@dataclass(frozen=True)
class Cell:
    ttft_ms: float
    tpot_ms: float
    tok_s: float  # closed loop: n x o / (TTFT + (o - 1) x TPOT)
    overload: float  # n x (c + o) / KV capacity


def _wall(overload: float, m0: float) -> float:
    if overload <= 1:
        return 1.0
    return 1 + (m0 - 1) * (overload - 1) / (_WALL_W0 - 1)


def cell(cfg: Config, p: Params, context: int, clients: int, output: int) -> Cell:
    """The expected TTFT median, TPOT and aggregate tok/s of `clients` closed-loop streams of
    `context` prompt tokens and `output` generated tokens."""
    n_run = min(clients, cfg.max_num_seqs)
    overload = n_run * (context + output) / max(kv_tokens(cfg), 1)
    ttft = _interp(BASE_TTFT, context, n_run) * _wall(overload, WALL_TTFT)
    tpot = _interp(BASE_TPOT, context, n_run) * _wall(overload, WALL_TPOT)
    r = (prefill_work(context, cfg.max_num_batched_tokens, cfg.padding_gap)
         / prefill_work(context, 4096, 0))
    ttft *= max(0.0, 1 + LADDER_K * (r - 1)) if r >= 1 else r
    if cfg.max_num_batched_tokens > 4096:
        ttft *= p.b8192_ttft
        tpot *= p.b8192_tpot
    if cfg.padding_gap > 0:
        tpot *= p.gap_tpot
    if cfg.kv_cache_dtype in FP8:
        tpot /= FP8_THROUGHPUT
        ttft /= FP8_THROUGHPUT
    if cfg.max_num_seqs < DEFAULT_SEQS:
        tpot *= 1 + p.seqs_cost * math.log2(DEFAULT_SEQS / cfg.max_num_seqs) / 2
    if cfg.max_model_len <= 16384:
        tpot *= TPOT_16K
    elif cfg.max_model_len >= 65536:
        tpot *= p.ml65536_tpot
    if cfg.speculative:
        gain = p.spec_gain - p.spec_drop * math.log2(max(n_run, 1)) / 6
        tpot /= max(0.2, 1 + gain)
    service = ttft / 1000 + (output - 1) * tpot / 1000
    if clients > n_run:  # the scheduler's queue: the rest wait for a sequence slot
        ttft += (clients / n_run - 1) * service * 1000
    tok_s = clients * output / (ttft / 1000 + (output - 1) * tpot / 1000)
    return Cell(ttft, tpot, tok_s, overload)


def usd_per_million(tok_s: float, usd_per_hour: float) -> float:
    return usd_per_hour / (tok_s * 3600) * 1e6
