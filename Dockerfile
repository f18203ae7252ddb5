# One Dockerfile, three images (docs/images.md: build, push, pass by digest):
#
#   --target trainer-tpu  the Trainer on a Cloud TPU VM (a Vertex AI custom job, or worker 0 of a multi-host
#                         slice): tensorflow-tpu + libtpu
#   --target trainer-gpu  the Trainer's Vertex AI custom job on NVIDIA GPUs: tensorflow[and-cuda]
#   --target pipeline     (the default, last stage) every other pipeline step, the Dataflow workers of the
#                         sharding step (--sdk_container_image) and TFMA: CPU TensorFlow
#
# Every image installs this project with constraints.txt, so each package is the version tested here; the
# trainer images swap only the TensorFlow build, at constraints.txt's TensorFlow version, with the pins of
# constraints-accelerators.txt. The dependencies are installed in layers of their own, before the code is
# copied in, so that a change of the code rebuilds only the last layer of each image.
#
#   docker build --target trainer-tpu -t REGION-docker.pkg.dev/PROJECT/effnet/trainer-tpu:TAG .
#
# The bases and the libtpu index are build arguments whose defaults are the real ones; scripts/images.sh builds
# stand-ins for them where Docker Hub and Google's index are out of reach (docs/images.md).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG BEAM_SDK_IMAGE=apache/beam_python3.11_sdk:2.59.0

# Beam's SDK harness boot program, which Dataflow starts the workers with: Beam 2.59.0 for Python 3.11.
FROM ${BEAM_SDK_IMAGE} AS beam-sdk

# The project's code, copied into each image last.
FROM scratch AS source
COPY beam_preprocess /pipeline/beam_preprocess
COPY components /pipeline/components
COPY effnet_common /pipeline/effnet_common
COPY pipeline /pipeline/pipeline
COPY trainer_module /pipeline/trainer_module

# The packages of the stack that PyPI has no wheel of and that compile C or C++ (pyfarmhash, which TFDV requires;
# crcmod, Beam's fast CRC for GCS), built into wheels here, so that no image carries a compiler.
FROM ${PYTHON_IMAGE} AS wheels
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update && apt-get install --yes --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
COPY constraints.txt ./
RUN pip wheel --use-pep517 --no-deps -c constraints.txt -w /wheels pyfarmhash crcmod

# The project's dependencies at constraints.txt's versions: setup.py without the packages it finds installs
# them and an empty project, which the code's own layer replaces. Python 3.11 is the Python constraints.txt was
# resolved for; tfx 1.16 declares Requires-Python <3.11 although its compiled dependencies ship 3.11 wheels.
FROM ${PYTHON_IMAGE} AS dependencies
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /pipeline
COPY --from=wheels /wheels /wheels
COPY setup.py constraints.txt constraints-accelerators.txt ./
RUN pip install --ignore-requires-python -c constraints.txt --find-links /wheels .


# TFX's Vertex Trainer replaces the container command with `python -m tfx.scripts.run_executor ...` (the
# executor then calls trainer_module.tfx_trainer.run_fn); CMD is that same program, so `docker run IMAGE`
# fails the same way the job would. No ENTRYPOINT: the job's command must run as given.
FROM dependencies AS trainer-tpu
ARG LIBTPU_FIND_LINKS=https://storage.googleapis.com/libtpu-tf-releases/index.html
# tfx, tfx-bsl, TFDV and TFMA require the distribution named `tensorflow`, which tensorflow-tpu does not
# satisfy, and both wheels write the same tensorflow/ package directory. So the CPU wheel is uninstalled
# before the TPU build goes in: one TensorFlow in the image (`pip check` then reports that tfx requires
# tensorflow; expected). libtpu exists only on Google's find-links index, not on PyPI. libtpu.so is also linked
# into /lib, where Vertex AI's TPU custom-container instructions put it.
RUN pip uninstall --yes tensorflow \
    && pip install -c constraints.txt -c constraints-accelerators.txt --find-links "$LIBTPU_FIND_LINKS" \
        tensorflow-tpu libtpu \
    && ln -s "$(python -c 'import libtpu; print(libtpu.__path__[0])')/libtpu.so" /lib/libtpu.so \
    && test -f /lib/libtpu.so
COPY --from=source /pipeline ./
RUN pip install --ignore-requires-python --no-deps --force-reinstall . \
    && python -c "import importlib.metadata as m, tensorflow as tf; \
assert 'tensorflow' not in {d.metadata['Name'].lower() for d in m.distributions()}, 'CPU tensorflow left'; \
assert 'tensorflow==' + tf.__version__ in open('constraints.txt').read().split(), tf.__version__" \
    && python -c "import beam_preprocess, components, effnet_common, pipeline, trainer_module"
CMD ["python", "-m", "tfx.scripts.run_executor"]


FROM dependencies AS trainer-gpu
# The same `tensorflow` distribution with its `and-cuda` extra: the CUDA 12.3 / cuDNN 8.9 wheels it pins. Its
# version is constraints.txt's; the host's NVIDIA driver comes from the Vertex AI machine.
RUN pip install -c constraints.txt -c constraints-accelerators.txt "tensorflow[and-cuda]"
COPY --from=source /pipeline ./
RUN pip install --ignore-requires-python --no-deps --force-reinstall . \
    && python -c "import tensorflow as tf; \
assert 'tensorflow==' + tf.__version__ in open('constraints.txt').read().split(), tf.__version__" \
    && python -c "import beam_preprocess, components, effnet_common, pipeline, trainer_module"
CMD ["python", "-m", "tfx.scripts.run_executor"]


# The pipeline image, last so that a plain `docker build .` builds it.
FROM dependencies AS pipeline
# Dataflow starts workers through the Beam SDK harness boot program of the same Beam version and Python.
COPY --from=beam-sdk /opt/apache/beam /opt/apache/beam
COPY --from=source /pipeline ./
RUN pip install --ignore-requires-python --no-deps --force-reinstall . \
    && python -c "import beam_preprocess, components, effnet_common, pipeline, trainer_module"
# Dataflow calls the boot program; TFX on Vertex / Kubeflow overrides the command of each step.
ENTRYPOINT ["/opt/apache/beam/boot"]
