"""Devices, the tf.distribute strategy, cluster resolvers and the local launcher."""
