"""Plan reviews: what a change does to each stack, as Markdown for a pull-request comment.

`review BASE [HEAD]` compares two revisions of the repository (HEAD defaults to the working
tree) three ways:

1. Terraform. Each revision is synthesized offline with ITS OWN main.py, stacks and templates:
   a git worktree for a commit, then a subprocess of the current venv's python with PYTHONPATH
   and cwd set to that tree, writing into a temporary outdir. Resources are compared by
   Terraform address (type.name), attribute by attribute.
2. The `vllm serve` argv, the container env and the compile-cache key, and
3. capacity and cost (the planner, SPEC 5-7). These come from each revision's config/ TOML
   files loaded with the CURRENT code: config is data, so today's validators and planner
   judge both revisions alike and a delta is the effect of the config change. When an old
   config fails today's validation, its problems are reported in the Markdown instead.

Each Terraform change also says what it does to the RUNNING server (`server_effect`: restart in
place warm or cold, node or queued resource replaced, ...): see effects.

Both revisions' code RUNS here (main.py and everything it imports). The synth subprocess gets
a throwaway HOME and TMPDIR, an allow-listed environment (locale, the two config variables,
the jsii knobs, a PATH of the directories that hold sh, node and terraform) and stdin closed:
no token, no GOOGLE_APPLICATION_CREDENTIALS or CLOUDSDK_CONFIG, no agent socket, and no
~/.config/gcloud reachable through HOME. It still runs as the calling user, so a file named by
its absolute path stays readable: review an untrusted revision where no credential lives
(the pull-request workflow, a container). `redact` masks anything token-shaped in everything
this package writes.

Modules, each importing only those listed before it:

- redact: masks token-shaped text.
- gate: the plan gate between a PR's synthesized JSON and `terraform plan` (stdlib only: it
  runs in the job that holds a credential; `python -m tpuserve.plan_gate` runs it).
- revision_facts: what a revision yields (its Synthesis, its ConfigFacts).
- config_facts: a revision's config/ read by the current code; the package's ONLY import
  of tpuserve.settings.
- model: the Review and its parts, and their JSON (each change's `server_effect`).
- effects: what each Terraform change does to the running server (restart in place warm or
  cold, node or queued resource replaced, ...; see its docstring) (pure).
- k8s_objects: the fleet's Kubernetes objects (its bundle, PyYAML's safe loader, read as
  hostile input): per object added, removed or changed with its changed paths, and what each
  does to the replicas (rolling restart warm or cold, scaling bounds) (pure).
- compare: Terraform documents, argv and env, capacity deltas, and `build_review` (pure).
- markdown: the pull-request comment.
- revisions: git (resolving revisions, detached worktrees).
- synthesis: the sandboxed synth of one tree, its memo, reading cdk.tf.json.
- run: `review()`, the I/O that gathers both revisions' facts and compares them.

Nothing is imported here, so `tpuserve.review.gate` stays light.
"""
