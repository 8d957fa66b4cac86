"""Lung-nodule analysis on chest CT: detect, segment, measure, grade, follow up, and evaluate (issue 13).

An application on top of deskpod's trainer: images in, nodules with their measurements out, and
the LUNA16 evaluation of a detector (`deskpod.lung.evaluate`). It is decision support, not a
medical device: every report it writes says so, and nothing it prints is a diagnosis.
"""
