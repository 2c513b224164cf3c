"""The control loops: the dispatcher (an outbox of CREATED jobs) and the syncer
(watch -> runtime state -> business state -> history), run under leader election
(cluster/leader.py) by runner.py. No Kubernetes client here: cluster/ does the calls.
"""
