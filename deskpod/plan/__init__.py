"""The performance model: workloads, predictions, calibration, reports (``deskpod plan``)."""
