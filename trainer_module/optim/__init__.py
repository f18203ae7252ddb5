"""The optimisation of the recipe: the paper's LARS, RMSProp in Keras' and TF1's form and SGD
(``optimizers``), the warmup-then-decay learning-rate schedules and the linear scaling rule (``schedules``),
and the moving average of the weights that evaluation and export read (``averaging``)."""
