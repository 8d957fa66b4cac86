"""Video analytics: many camera streams indexed at once, a face searched by photo.

The pipeline, one module a stage: `sources` (files, folders, live URLs, decoded by PyAV and sampled at a rate) →
`detectors` (people and faces, a batch of frames from all streams at a time) → `tracking` (ByteTrack per stream)
→ `faces` (dlib's 128-d embedding of each face track) → `store` (SQLite, committed per batch, restartable) ←
`search` (a face by photo, through `vectors`' FAISS index). `indexer` runs the first five over many streams;
``deskpod video`` (deskpod/cli/video.py) is the command. docs/video.md is the user guide.
"""
