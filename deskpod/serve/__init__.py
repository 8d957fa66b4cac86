"""Inference serving: model repository, runtimes, dynamic batcher, the v2 protocol server, a load generator.

``deskpod export RUN`` writes a trained model into a repository; ``deskpod serve REPO`` serves it over the
KServe/Triton v2 protocol (the official ``tritonclient`` works unchanged); ``deskpod bench serve`` measures any
v2 server. Heavy libraries (onnxruntime, torch) are imported only where a model is loaded or exported.
"""
