# Stands in for Docker Hub's python:3.11-slim-bookworm where Docker Hub is out of reach (scripts/images.sh):
# Debian bookworm's own Python 3.11 (a root file system made with mmdebstrap from Debian's packages and
# imported as BASE), in a virtual environment on PATH, so that `python` and `pip` are what they are in the
# official image. The host's CA bundle comes in with it: pip in the build reaches the package index through
# what this machine trusts. pip trusts 127.0.0.1 over plain HTTP: the stand-in libtpu index is served there.
ARG BASE
FROM ${BASE}
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
RUN python3.11 -m venv /usr/local/python
ENV PATH=/usr/local/python/bin:$PATH LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_TRUSTED_HOST=127.0.0.1
CMD ["python3"]
