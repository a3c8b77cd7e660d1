"""Calibration: exit adapter, draft vocabulary, confidence threshold and autotuning (export extra)."""
