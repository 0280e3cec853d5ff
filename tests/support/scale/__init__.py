"""The control-plane scale harness's parts (bench/bench_control_plane.py drives them).

- `simnodes`: a process holding many simulated node agents against a real etcd.
- `sim_cluster`: the `Cluster` the real controller acts through, whose nodes are the simulated ones.
- `controller_host`: a process running the real `JobController` over that cluster, timing its ticks.
- `hostlink`: the line-of-JSON protocol between those processes and the bench.
- `etcd_metrics`: etcd's own /metrics, scraped and differenced over a window.
"""
