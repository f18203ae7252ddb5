"""The network: EfficientNet B0-B7 and two small variants built from a stage table and one block function
(``efficientnet``), its layers with the norm injected (``blocks``), swish with a fused gradient
(``activations``), and the variants' compound scaling as data (``variants``, no TensorFlow: the config reads
it)."""
