"""The exported SavedModel: what a Vertex endpoint (TensorFlow Serving), a client and TFMA call.

Two signatures, each preprocessing with the evaluation centre crop and running the model in inference mode
(moving statistics):

- ``serving_default(image_bytes: tf.string[None])``: JPEG bytes, what a client has. A Vertex endpoint sends
  its ``{"instances": [{"b64": "..."}]}`` to this signature; TensorFlow Serving's REST layer decodes each
  ``b64`` object into one element of the string tensor. It answers, per image, ``classes`` (the top class's
  index), ``synsets`` (its synset, from the shards' manifest), and the top ``TOP_K`` of them:
  ``top_classes``, ``top_synsets``, ``top_probabilities`` (highest first).
- ``serve_tf_examples(examples: tf.string[None])``: serialized tf.Example records of the beam_preprocess
  schema, what TFMA feeds the Evaluator; it answers ``probabilities`` [batch, num_classes] (softmax of the
  float32 logits) and ``classes``.

Every output's first dimension is the batch, as TensorFlow Serving's row ("instances") format requires.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import tensorflow as tf

from effnet_common import schema
from trainer_module.data import input_pipeline

SERVING_SIGNATURE = "serving_default"  # what a Vertex endpoint calls
EXAMPLES_SIGNATURE = "serve_tf_examples"  # what TFMA calls (pipeline.pipeline_def.eval_config)
IMAGE_INPUT = "image_bytes"  # '_bytes': binary data, by the naming convention of Vertex's TensorFlow docs
EXAMPLES_INPUT = "examples"
PROBABILITIES = "probabilities"
CLASSES = "classes"
SYNSETS = "synsets"
TOP_CLASSES = "top_classes"
TOP_SYNSETS = "top_synsets"
TOP_PROBABILITIES = "top_probabilities"
TOP_K = 5


def class_synsets(classes: Sequence[str] | None, num_classes: int) -> list[str]:
    """The name of each class index the model answers: the shards' classes (their manifest's synsets), or
    ImageNet's 1000 sorted synsets where the shards have no manifest (as the trainer's label check assumes);
    the index itself where neither matches the model's width."""
    if classes is None and num_classes == schema.NUM_CLASSES:
        classes = schema.synsets()
    if classes is not None and len(classes) == num_classes:
        return list(classes)
    return [str(index) for index in range(num_classes)]


class _Signatures:
    """The two signatures' functions over one model (traced by ``keras.export.ExportArchive``)."""

    def __init__(
        self,
        model: keras.Model,
        image_size: int,
        crop_padding: int | None,
        clip_resized: bool,
        synsets: Sequence[str],
    ):
        self._model = model
        self._image_size = image_size
        self._crop_padding = crop_padding
        self._clip_resized = clip_resized
        self._synsets = tf.constant(list(synsets), tf.string)
        self._top_k = min(TOP_K, len(synsets))
        # One function for both signatures: the network is traced once, not once per signature.
        self._probabilities = tf.function(
            self._probabilities_of_jpegs, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False
        )

    def _probabilities_of_jpegs(self, jpegs):
        images = tf.map_fn(
            lambda jpeg: input_pipeline.preprocess_for_eval(
                jpeg, self._image_size, self._crop_padding, self._clip_resized
            ),
            jpegs,
            fn_output_signature=tf.TensorSpec([self._image_size, self._image_size, 3], tf.float32),
        )
        return tf.nn.softmax(tf.cast(self._model(images, training=False), tf.float32))

    def answer(self, image_bytes):
        top = tf.math.top_k(self._probabilities(image_bytes), k=self._top_k)
        return {
            CLASSES: top.indices[:, 0],
            SYNSETS: tf.gather(self._synsets, top.indices[:, 0]),
            TOP_CLASSES: top.indices,
            TOP_SYNSETS: tf.gather(self._synsets, top.indices),
            TOP_PROBABILITIES: top.values,
        }

    def evaluate(self, examples):
        parsed = tf.io.parse_example(examples, {schema.IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string)})
        probabilities = self._probabilities(parsed[schema.IMAGE_ENCODED])
        return {
            PROBABILITIES: probabilities,
            CLASSES: tf.argmax(probabilities, axis=-1, output_type=tf.int32),
        }


def export_saved_model(
    model: keras.Model,
    image_size: int,
    export_dir: str,
    crop_padding: int | None = None,
    clip_resized: bool = True,
    classes: Sequence[str] | None = None,
) -> str:
    """Writes the SavedModel with both signatures to ``export_dir`` and returns the path.

    ``crop_padding`` (``TrainingPlan.eval_crop_padding_pixels``) and ``clip_resized`` (``data.clip_resized``)
    are the run's, so the served model sees images prepared exactly as in the in-loop evaluation.
    ``classes`` are the synsets in label order (``input_pipeline.shard_classes`` of the training shards; see
    ``class_synsets`` without them).
    """
    signatures = _Signatures(
        model, image_size, crop_padding, clip_resized, class_synsets(classes, int(model.output_shape[-1]))
    )
    # Keras's export archive, not tf.saved_model.save of a tf.Module holding the model: that one saves the
    # Keras variables apart from the tf.Variables the signatures capture, so a loader that restores through
    # the graph's saver (TensorFlow Serving's C++ LoadSavedModel) leaves the captured ones unset and every
    # call fails with "Could not find variable" (tensorflow/tensorflow#72963; Python's loader hides it).
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        SERVING_SIGNATURE, signatures.answer, [tf.TensorSpec([None], tf.string, name=IMAGE_INPUT)]
    )
    archive.add_endpoint(
        EXAMPLES_SIGNATURE, signatures.evaluate, [tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)]
    )
    # A fresh directory: nothing of an earlier export (another run of the same model dir) may mix in.
    if tf.io.gfile.exists(export_dir):
        tf.io.gfile.rmtree(export_dir)
    # Serving never differentiates: leaving out the gradient functions of the swish activation's custom
    # gradient (one per activation of the network) saves most of the export's time.
    archive.write_out(
        export_dir, options=tf.saved_model.SaveOptions(experimental_custom_gradients=False), verbose=False
    )
    return export_dir
