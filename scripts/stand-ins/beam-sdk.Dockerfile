# Stands in for Docker Hub's apache/beam_python3.11_sdk:2.59.0 where Docker Hub is out of reach
# (scripts/images.sh): the Dockerfile copies /opt/apache/beam from it, the SDK harness boot program that
# Dataflow starts its workers with. Only that program's place is stood in: its stand-in says what it is and
# fails, so an image built on it cannot pass for one Dataflow can start.
FROM scratch
COPY beam-boot.sh /opt/apache/beam/boot
