"""Calibration steps (export extra): data, exit adapters, draft vocabulary, autotune, measured defaults.

Each step is a function the export pipeline calls (export/calibrate.py); nothing here exports or
installs a bundle.
"""
