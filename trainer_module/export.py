"""The exported SavedModel: what TFMA, TF Serving and a Vertex endpoint call.

Two signatures, both returning ``probabilities`` [batch, num_classes] (softmax of the float32 logits) and
``classes`` (the arg-max label):
- ``serving_default(examples: tf.string[None])``: serialized tf.Example records of the beam_preprocess schema
  (what TFMA feeds the Evaluator);
- ``serve_jpeg(images: tf.string[None])``: raw JPEG bytes.
Both preprocess with the evaluation centre crop and run the model in inference mode (moving statistics).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from effnet_common import schema
from trainer_module import input_pipeline

PROBABILITIES = "probabilities"
CLASSES = "classes"


class _ServingModule(tf.Module):
    def __init__(self, model: keras.Model, image_size: int, crop_padding: int | None, clip_resized: bool):
        super().__init__()
        self.model = model
        self._image_size = image_size
        self._crop_padding = crop_padding
        self._clip_resized = clip_resized

    def _predict(self, jpegs):
        images = tf.map_fn(
            lambda jpeg: input_pipeline.preprocess_for_eval(
                jpeg, self._image_size, self._crop_padding, self._clip_resized
            ),
            jpegs,
            fn_output_signature=tf.TensorSpec([self._image_size, self._image_size, 3], tf.float32),
        )
        logits = tf.cast(self.model(images, training=False), tf.float32)
        return {
            PROBABILITIES: tf.nn.softmax(logits),
            CLASSES: tf.argmax(logits, axis=-1, output_type=tf.int32),
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve_examples(self, examples):
        parsed = tf.io.parse_example(examples, {schema.IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string)})
        return self._predict(parsed[schema.IMAGE_ENCODED])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="images")])
    def serve_jpeg(self, images):
        return self._predict(images)


def export_saved_model(
    model: keras.Model,
    image_size: int,
    export_dir: str,
    crop_padding: int | None = None,
    clip_resized: bool = True,
) -> str:
    """Writes the SavedModel with both signatures to ``export_dir`` and returns the path.

    ``crop_padding`` is the run's evaluation crop (``TrainingPlan.eval_crop_padding_pixels``), so the served
    model sees images prepared exactly as in the in-loop evaluation; so is ``clip_resized`` (``data.clip_resized``).
    """
    module = _ServingModule(model, image_size, crop_padding, clip_resized)
    # A fresh directory: nothing of an earlier export (another run of the same model dir) may mix in.
    if tf.io.gfile.exists(export_dir):
        tf.io.gfile.rmtree(export_dir)
    tf.saved_model.save(
        module,
        export_dir,
        signatures={"serving_default": module.serve_examples, "serve_jpeg": module.serve_jpeg},
    )
    return export_dir
