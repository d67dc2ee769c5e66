"""The node: a shell that applies the pure protocol core to stored state and persists every
transition atomically.

- :mod:`.config`: :class:`~.config.NodeConfig` and its JSON file format;
- :mod:`.service`: :class:`~.service.NodeService`, the ``rpc.service.TrainingService`` the
  JSON-RPC transport calls (plus ``tick`` for deadlines);
- :mod:`.persistence`: stored value encodings and the one function that turns a transition into
  batch operations;
- :mod:`.checkpoint`: loading and verifying a task's init checkpoint;
- :mod:`.model_state`: stored encodings of the global model (the model itself and the round
  update, aggregation + outer step, are the pure core's ``tenzro_training.global_model``);
- ``main``, ``dev``, ``syncer``: the node process, dev genesis and the syncer daemon.

This package is NOT the protocol: every rule lives in the pure core (``tenzro_training.run``,
``aggregation``, ``outer``, ...); the node only loads, calls and stores. See docs/node.md.
"""
