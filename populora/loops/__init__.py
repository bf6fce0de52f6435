"""The loops: everything that runs steps over populations, above the mechanism that makes a step.

- :mod:`populora.loops.env`: :func:`~populora.loops.env.evolve_with_env` (GA or ES against environments);
- :mod:`populora.loops.coevolve`: :class:`~populora.loops.coevolve.Coevolve` and its hall of fame;
- :mod:`populora.loops.selfplay`: :class:`~populora.loops.selfplay.PopuLoRA` (teachers and students on one
  language model) and :class:`~populora.loops.selfplay.SelfPlay`;
- :mod:`populora.loops.pbt`: :class:`~populora.loops.pbt.PBT` (population-based training);
- :mod:`populora.loops.ratings`: :class:`~populora.loops.ratings.Ratings` (openskill ratings that follow
  evolution);
- :mod:`populora.loops.base`: what every loop shares (the callback rule, ``run``'s budget).

Nothing is imported here: ``import populora.loops`` costs nothing until a loop is used.
"""
