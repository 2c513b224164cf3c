"""The only room that talks to Kubernetes: client setup, list+watch caches,
snapshots for the diagnosis, idempotent create and delete, leader election.

The client library stays inside: what fails reaches the rooms above as ClusterError
(errors.py), and they hold clients by the names client.py gives them.
"""
