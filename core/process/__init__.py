"""This operating-system process: how it ends, and which cores it runs on.

`parent_death`: a child (a grader server, a job's rank, a `pdppo dev` service) that must not
outlive its parent, even one killed by SIGKILL; `threads`: how many torch threads a training
process gets, its share of the cores it may run on.

Imports: the standard library (and torch, for its thread count), nothing else from `core`.
"""
