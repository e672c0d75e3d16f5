"""The API-key proxy's nginx.conf (templates/nginx.conf.j2): config in, text out, no I/O.

The node runs the pinned Alpine `nginx` image; tests run Debian's `nginx` package against the
SAME template. What differs between the two (worker user, the key include's path, the TLS
files, pid, logs, temp dirs) is a `ProxyLayout`, a render-time parameter, never a patched copy.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from tpuserve.render.templates import environment

# The one request that needs no key: the method and the raw request target (nginx's
# $request_uri, before it decodes %XX, merges slashes or resolves dot segments), compared
# case-sensitively. vLLM (Starlette) routes on the raw path, so nothing looser is safe.
OPEN_METHODS = ("GET", "HEAD")
OPEN_URI = "/health"
TLS_MODES = ("self-signed", "off")
# Open to in-cluster collectors only (render_nginx_conf's metrics_allow): GET, this raw target.
METRICS_URI = "/metrics"


@dataclass(frozen=True)
class ProxyLayout:
    """Where one nginx build keeps its files (paths as the nginx process sees them)."""

    user: str  # the worker processes' user
    key_include: str  # the key rule, written at boot into the secrets tmpfs (0600)
    tls_cert: str  # PEM certificate (public)
    tls_key: str  # PEM private key (0600, tmpfs, generated on the node)
    pid: str
    error_log: str
    access_log: str
    temp_dir: str = ""  # "": the build's own temp paths


# The pinned Alpine image on the node: the boot script bind-mounts the files to these paths.
NODE_LAYOUT = ProxyLayout(
    user="nginx",
    key_include="/etc/nginx/tpuserve/api-key.conf",
    tls_cert="/etc/nginx/tpuserve/tls-cert.pem",
    tls_key="/etc/nginx/tpuserve/tls-key.pem",
    pid="/var/run/nginx.pid",
    error_log="/dev/stderr",
    access_log="/dev/stdout",
)

# Every value rendered is an int or a fixed path: nothing to quote.
_env = environment()


def render_nginx_conf(
    *, public_port: int, backend_port: int, tls: bool, layout: ProxyLayout = NODE_LAYOUT,
    metrics_allow: tuple[str, ...] = (),
) -> str:
    """nginx.conf for the proxy on `public_port` (TLS when `tls`) in front of vLLM on
    127.0.0.1:`backend_port`.

    `metrics_allow` (the fleet's pods; empty on a VM, whose output it leaves unchanged): source
    ranges from which exactly `GET /metrics` (raw request target, as for /health) needs no key,
    judged on the connection's own address, never a forwarded header."""
    nets = tuple(str(ipaddress.ip_network(c, strict=True)) for c in metrics_allow)
    text = _env.get_template("nginx.conf.j2").render(
        public_port=int(public_port), backend_port=int(backend_port), tls=tls, layout=layout,
        open_methods="|".join(OPEN_METHODS), open_uri=OPEN_URI,
        metrics_allow=nets, metrics_uri=METRICS_URI,
    )
    return text if text.endswith("\n") else text + "\n"
