# The pipeline image: every Vertex / Kubeflow step, the Dataflow workers of the sharding step
# (--sdk_container_image) and the Trainer's Vertex AI custom job on a TPU slice run this image.
#
#   docker build -t REGION-docker.pkg.dev/PROJECT/effnet/pipeline:latest .
#   docker push REGION-docker.pkg.dev/PROJECT/effnet/pipeline:latest
FROM python:3.11-slim-bookworm

# Dataflow starts workers through the Beam SDK harness boot program of the same Beam version.
COPY --from=apache/beam_python3.11_sdk:2.59.0 /opt/apache/beam /opt/apache/beam

WORKDIR /pipeline
COPY setup.py constraints.txt README.md ./
COPY beam_preprocess beam_preprocess
COPY components components
COPY pipeline pipeline
COPY trainer_module trainer_module

# tfx 1.16 declares Requires-Python <3.11 although its compiled dependencies ship 3.11 wheels (see README).
RUN pip install --no-cache-dir --ignore-requires-python -c constraints.txt . \
    && python -c "import beam_preprocess, components, pipeline, trainer_module"

# Dataflow calls the boot program; TFX on Vertex / Kubeflow overrides the command of each step.
ENTRYPOINT ["/opt/apache/beam/boot"]
