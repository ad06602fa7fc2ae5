"""The ground: the vocabulary every part shares (samples, incidents, units, selectors, config
types, health, clocks, node facts such as the cgroup layout and pod cgroups, the extension
registry).

Nothing here imports a part of sloguard (collectors, store, detector, actuators, ui, plugins)
or an application (agent, server, cli, lab): the import contract in pyproject.toml enforces it,
so a part can use any of it without pulling in another part.
"""
