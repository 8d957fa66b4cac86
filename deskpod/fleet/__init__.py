"""The fleet: many pods run as one (``deskpod fleet up``), a pod service whose executor hands jobs to member pods.

::

    keys.py       the fleet's Ed25519 key pair and the assertions it signs (checked by `deskpod.jobs.trust`)
    members.py    the members table (in the fleet pod's SQLite file)
    client.py     a member's REST API as the fleet calls it: an assertion per request
    snapshot.py   what the fleet knows of each member (`MemberSnapshot`), asked concurrently and cached
    routing.py    which member a job goes to and why: a pure function over snapshots
    executor.py   `FleetExecutor`: route, forward, follow (leases), mirror, cancel, logs
    api.py        the fleet's routes beside the pod's: members (add, list, remove), its public key

Nothing below ``cli`` imports this package; `deskpod.jobs` knows only assertions and leases.
"""
