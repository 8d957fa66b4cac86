"""The fleet: many pods run as one (``deskpod fleet up``), a pod service whose executor hands jobs to member pods.

::

    keys.py       the fleet's Ed25519 key pair and the assertions it signs (checked by `deskpod.jobs.trust`)
    members.py    the members table (in the fleet pod's SQLite file)
    client.py     a member's REST API as the fleet calls it: an assertion per request
    snapshot.py   what the fleet knows of each member (`MemberSnapshot`), asked concurrently and cached
    routing.py    which member a job goes to and why: a pure function over snapshots
    executor.py   `FleetExecutor`: route, forward, follow (leases), mirror, cancel, logs
    api.py        the fleet's routes beside the pod's: members (add, list, remove), its public key
    stacks.py     stacks: named, versioned environments a job names (`stack = "..."`), pinned at submission
    rollout.py    a stack's version built and smoke-tested on each member in turn
    stack_api.py  the stack routes (publish, status, rollout) and their client

Nothing below ``cli`` imports this package; `deskpod.jobs` knows only assertions and leases.
"""
