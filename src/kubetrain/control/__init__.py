"""The control loops: the dispatcher (an outbox of CREATED jobs), the syncer
(watch -> runtime state -> business state -> history) and leader election."""
