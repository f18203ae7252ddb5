#!/bin/sh
echo "error: /opt/apache/beam/boot of this image is a stand-in built by scripts/images.sh (Docker Hub was out of" \
  "reach): build with the default BEAM_SDK_IMAGE to run Dataflow workers; pipeline steps override it" >&2
exit 2
