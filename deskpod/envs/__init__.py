"""Per-job software environments and sandboxes.

`definition` parses a job spec's ``[environment]`` table; `python` finds this box's interpreters; `index` turns
pip's configuration into uv's; `cache` builds environments once, keyed by the hash of what defines them, and
keeps, lists and prunes them; `images` runs container-image environments (podman or enroot); `sandbox` and
`accounts` give each job its own walls and OS account.
"""
