"""Studies of the suite itself: calibration, the fault-detection matrix, peers' statistics, fuzz replay."""
