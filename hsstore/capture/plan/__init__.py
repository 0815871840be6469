"""Before a build: size, space and time estimates, calibration."""
