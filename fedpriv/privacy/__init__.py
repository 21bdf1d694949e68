"""Privacy mechanisms shared by central DP-SGD and federated DP-FedAvg.

``aggregate`` holds the one clip-and-noise function (the unit is one example's gradient or one
user's model delta), ``adaptive_clip`` the quantile-tracking clip norm of Andrew et al. 2021.
"""
