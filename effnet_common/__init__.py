"""What every stage of the pipeline shares, with no heavy imports (no TensorFlow; Beam only when a path is
read or a Beam pipeline is made). Every other package imports from here (docs/architecture.md):

- ``schema``: the shard record's contract (feature keys, label convention, ImageNet's synsets and sizes);
- ``manifest``: the typed manifest of a sharding run, the one module that reads and writes it;
- ``storage``: every user path through Beam's ``FileSystems`` (local, ``gs://``), whole-object writes;
- ``whole``: the one rule for writing a file whole (``storage`` and the trainer's ``tf.io.gfile`` files);
- ``console``: what a command prints and logs (one line per step, errors in one line, logs to a file);
- ``path_checks``: the checks of a person's paths before any work (a file readable, a directory writable);
- ``registry``: the name -> builder registries every choice is validated and built by;
- ``stopping``: Ctrl-C ends a command in one line, leaving nothing temporary behind;
- ``cloud_retry``: the one retry policy of every cloud API call, and how long a followed job's API is awaited;
- ``dataflow_jobs``: a Beam pipeline whose Dataflow job is cancelled when its process is stopped, and a run's
  Dataflow jobs found and cancelled.
"""
