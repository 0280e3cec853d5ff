"""Discrete-event simulation of a long training job under failures, driving the real policy code.

    python bench/bench_ettr_sim.py            # the ETTR table (docs/simulator.md explains the model)

rates.py (published failure data), measured.py (local recovery measurements), control_plane.py
(the control plane's measured times at the job's size), scaling.py (carrying them to 9,600 GPUs),
strategies.py (requeue, ByteRobust-like, Stalwart), events.py and pool.py (the event queue and the
standby pool), model.py (one run), run.py (many seeds), report.py.
"""
