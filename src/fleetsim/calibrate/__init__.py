"""Calibration of the step model to a deployment's own measurements (``fleetsim calibrate``)."""
