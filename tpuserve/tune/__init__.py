"""`tpuserve tune STACK`: the measured flag search on the user's own node.

candidates (from the planner, each validated by the real settings) -> search (successive
halving on $/M output tokens under the user's constraints) -> runner (budget, state file,
safety: the node is never left on a half-tried config) -> result (the TOML overlay, the
Markdown report, the Pareto PNG, the PR). The node is a Protocol (node.py): the tests drive a
fake; the TPU-API implementation plugs in behind it.
"""
