"""One module per decoding method: its options section, their checks, the models it needs, its
artifact checks, its output columns and refusals, and how it is built (`spec.StrategySpec`). Each is
torch-free: the job's driver reads them all, and only a builder, run in the actor, imports its
method's runtime code. `strategies.registry` lists them.
"""
