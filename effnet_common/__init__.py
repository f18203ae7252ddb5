"""What every stage of the pipeline shares, with no heavy imports (no TensorFlow, Beam only when a path is read):

- ``schema``: the data contract of a shard record (feature keys, label convention, ImageNet's synsets and sizes);
- ``manifest``: the typed manifest of a sharding run, the one module that reads and writes it;
- ``storage``: every user path through Beam's ``FileSystems`` (local, ``gs://``), whole-object writes;
- ``whole``: the one rule for writing a file whole, shared by ``storage`` and the trainer's ``tf.io.gfile`` files;
- ``console``: what a command prints and logs (one line per step, errors in one line, logs to a file);
- ``path_checks``: the checks of a person's paths before any work (a file readable, a directory writable);
- ``registry``: the name -> builder registries every choice is validated and built by.

``beam_preprocess``, ``trainer_module``, ``components`` and ``pipeline`` import from here; ``trainer_module``
imports nothing from ``beam_preprocess``.
"""
