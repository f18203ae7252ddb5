# One Dockerfile, three images (docs/images.md: build, push, pass by digest):
#
#   --target trainer-tpu  the Trainer's Vertex AI custom job on a Cloud TPU VM: tensorflow-tpu + libtpu
#   --target trainer-gpu  the Trainer's Vertex AI custom job on NVIDIA GPUs: tensorflow[and-cuda]
#   --target pipeline     (the default, last stage) every other pipeline step, the Dataflow workers of the
#                         sharding step (--sdk_container_image) and TFMA: CPU TensorFlow
#
# Every image installs this project with constraints.txt, so each package is the version tested here; the
# trainer images swap only the TensorFlow build, at constraints.txt's TensorFlow version, with the pins of
# constraints-accelerators.txt. tests/test_images.py checks that these files agree.
#
#   docker build --target trainer-tpu -t REGION-docker.pkg.dev/PROJECT/effnet/trainer-tpu:TAG .

# The project's source, shared by every image. python 3.11 is the Python constraints.txt was resolved for.
FROM python:3.11-slim-bookworm AS source
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /pipeline
COPY setup.py constraints.txt constraints-accelerators.txt README.md ./
COPY beam_preprocess beam_preprocess
COPY components components
COPY effnet_common effnet_common
COPY pipeline pipeline
COPY trainer_module trainer_module


# TFX's Vertex Trainer replaces the container command with `python -m tfx.scripts.run_executor ...` (the
# executor then calls trainer_module.tfx_trainer.run_fn); CMD is that same program, so `docker run IMAGE`
# fails the same way the job would. No ENTRYPOINT: the job's command must run as given.
FROM source AS trainer-tpu
# tfx, tfx-bsl, TFDV and TFMA require the distribution named `tensorflow`, which tensorflow-tpu does not
# satisfy, and both wheels write the same tensorflow/ package directory. So the CPU wheel the project pulls in
# is uninstalled before the TPU build goes in: one TensorFlow in the image (so `pip check` reports that tfx
# requires tensorflow; expected). libtpu exists only on Google's find-links index, not on PyPI.
# libtpu.so is also linked into /lib, where Vertex AI's TPU custom-container instructions put it.
RUN pip install --ignore-requires-python -c constraints.txt . \
    && pip uninstall --yes tensorflow \
    && pip install -c constraints.txt -c constraints-accelerators.txt \
        --find-links https://storage.googleapis.com/libtpu-tf-releases/index.html tensorflow-tpu libtpu \
    && ln -s "$(python -c 'import libtpu; print(libtpu.__path__[0])')/libtpu.so" /lib/libtpu.so \
    && test -f /lib/libtpu.so \
    && python -c "import importlib.metadata as m, tensorflow as tf; \
assert 'tensorflow' not in {d.metadata['Name'].lower() for d in m.distributions()}, 'CPU tensorflow left'; \
assert 'tensorflow==' + tf.__version__ in open('constraints.txt').read().split(), tf.__version__" \
    && python -c "import beam_preprocess, components, effnet_common, pipeline, trainer_module"
CMD ["python", "-m", "tfx.scripts.run_executor"]


FROM source AS trainer-gpu
# The same `tensorflow` distribution with its `and-cuda` extra: the CUDA 12.3 / cuDNN 8.9 wheels it pins. Its
# version is constraints.txt's; the host's NVIDIA driver comes from the Vertex AI machine.
RUN pip install --ignore-requires-python -c constraints.txt -c constraints-accelerators.txt . "tensorflow[and-cuda]" \
    && python -c "import tensorflow as tf; \
assert 'tensorflow==' + tf.__version__ in open('constraints.txt').read().split(), tf.__version__" \
    && python -c "import beam_preprocess, components, effnet_common, pipeline, trainer_module"
CMD ["python", "-m", "tfx.scripts.run_executor"]


# The pipeline image, last so that a plain `docker build .` builds it.
FROM source AS pipeline
# Dataflow starts workers through the Beam SDK harness boot program of the same Beam version and Python.
COPY --from=apache/beam_python3.11_sdk:2.59.0 /opt/apache/beam /opt/apache/beam
# tfx 1.16 declares Requires-Python <3.11 although its compiled dependencies ship 3.11 wheels (see README).
RUN pip install --ignore-requires-python -c constraints.txt . \
    && python -c "import beam_preprocess, components, effnet_common, pipeline, trainer_module"
# Dataflow calls the boot program; TFX on Vertex / Kubeflow overrides the command of each step.
ENTRYPOINT ["/opt/apache/beam/boot"]
