"""Training across replicas: the tf.distribute strategy a run asks for (``strategies``), batch norm whose
statistics are shared by a group of replicas or split into ghost sub-batches (``batchnorm``), and the pure
maths of which replicas form a group, consecutive or as 2-D tiles of a TPU torus (``replica_groups``). How
many replicas a group holds is resolved by the config's plan, which imports nothing from here."""
