"""Tracking: detections of one stream linked across frames by ByteTrack (Roboflow's ``trackers``).

One ``trackers.ByteTrackTracker`` per stream and label: a face box sits inside its person's box, and a tracker of
both would have the two compete for one track. The tracker takes ``supervision.Detections`` and the frame's time
(so a stream sampled at 5 fps, or one that skipped frames, keeps its motion model right), and gives each box a
track id, or -1 while a new track is not yet confirmed (ByteTrack wants it in ``minimum_consecutive_frames``).
Scores are not passed: the detectors' scores are on scales of their own (an SVM margin, a CNN score), not the
probabilities ByteTrack's two thresholds assume; each box counts as a confident one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import supervision as sv
import trackers

from deskpod.video.detectors import Detection


class StreamTracker:
    """The tracks of one stream (all its labels)."""

    def __init__(self, fps: float, lost_after_s: float = 2.0) -> None:
        self.fps = fps
        self.lost_after_s = lost_after_s
        self._trackers: dict[str, trackers.ByteTrackTracker] = {}

    def _tracker(self, label: str) -> trackers.ByteTrackTracker:
        if label not in self._trackers:
            self._trackers[label] = trackers.ByteTrackTracker(
                lost_track_buffer=max(1, round(self.lost_after_s * self.fps)),
                frame_rate=self.fps,
                minimum_consecutive_frames=2,
            )
        return self._trackers[label]

    def update(self, detections: Sequence[Detection], t: float, labels: Sequence[str]) -> list[tuple[int, Detection]]:
        """The confirmed tracks' boxes at time ``t``: (tracker's id, detection); ids are unique per label.
        ``labels``: every label this stream is tracked for (a label with no box this frame still ages its tracks)."""
        out: list[tuple[int, Detection]] = []
        for label in labels:
            mine = [d for d in detections if d.label == label]
            boxes = np.array([d.box for d in mine], dtype=np.float32).reshape(-1, 4)
            tracked = self._tracker(label).update(sv.Detections(xyxy=boxes), timestamp=t)
            ids = tracked.tracker_id if tracked.tracker_id is not None else np.full(len(tracked), -1)
            for xyxy, tid in zip(tracked.xyxy, ids, strict=True):
                if tid < 0:
                    continue
                best = max(mine, key=lambda d: _iou(d.box, xyxy), default=None)
                if best is not None:
                    out.append((int(tid), best))
        return out


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0
