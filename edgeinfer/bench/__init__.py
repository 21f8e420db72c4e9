"""``edgeinfer bench``: latency percentiles, cold start, throughput and memory, side by side."""
