"""The ranks of one job: the data-parallel world and the model split over it.

`distributed`: the world (rank, size), its process group on one machine, the collectives a step
needs (gradients, metrics), and the group's teardown (vLLM's groups first, where an engine runs);
`sharding`: FSDP2, each rank holding a shard of the parameters instead of a replica.

Imports: `core.config`, `core.models`; not the training loop (`core.training` calls this).
"""
