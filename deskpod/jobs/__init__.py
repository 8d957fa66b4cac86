"""The pod service: job specs, the SQLite store, the scheduler, the process supervisor, the HTTP API and its client.

``deskpod up`` runs `deskpod.jobs.daemon.serve`; the CLI talks to it through `deskpod.jobs.client`.
Nothing is imported here, so the client stays light (no FastAPI) for the CLI.
"""
