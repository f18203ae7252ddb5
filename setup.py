"""effnet-pipeline: the large-batch EfficientNet ImageNet recipe as a TFX / Kubeflow pipeline.

The pins mirror constraints.txt: the newest versions of the stack that install together on
Debian 12 / CPython 3.11. tfx 1.16 declares Requires-Python <3.11 although all its compiled
dependencies ship cp311 wheels, so a pip install needs ``--ignore-requires-python``; uv (what
scripts/setup_env.sh installs with) does not enforce that upper bound (see docs/architecture.md, "The pinned stack and its installer").
"""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "tensorflow>=2.16,<2.17",
    "tfx[kfp]==1.16.0",
    "kfp>=2.6,<2.14",
    "apache-beam[gcp]==2.59.0",
    # Dataflow's jobs API (list, read, cancel a run's jobs): the public GAPIC client. Its 0.8 line accepts
    # protobuf 4.25 (tfx 1.16 caps protobuf < 5).
    "google-cloud-dataflow-client==0.8.17",
    # The Cloud TPU API (queued resources, nodes) for the Trainer on a multi-host TPU slice (components/tpu_vm.py):
    # 1.25.0 is the newest release that accepts protobuf 4.25.5 (1.26 needs 4.25.8, 1.28 protobuf 6).
    "google-cloud-tpu==1.25.0",
    "tensorflow-model-analysis==0.47.1",
    "protobuf>=4.25.2,<5",
    "pyarrow>=10,<11",
    "pillow>=10",
    # CRC32C of the TFRecord framing, written without TensorFlow in Beam workers.
    "google-crc32c>=1.5",
    "numpy<2",
    # scikit-learn ships the real scanned digits the embedded demo data is rendered from.
    "scikit-learn",
    # Plots of the run report and the large-batch study (PNG, Agg backend).
    "matplotlib>=3.8",
]

TFDS = ["tensorflow-datasets==4.9.10", "importlib_resources"]

setup(
    name="effnet-pipeline",
    version="0.1.0",
    description="Large-batch EfficientNet on ImageNet as a TFX / Kubeflow pipeline",
    python_requires=">=3.10",
    packages=find_packages(
        include=["beam_preprocess*", "components*", "effnet_common*", "pipeline*", "trainer_module*"]
    ),
    # The ILSVRC2012 synset and validation-label lists (effnet_common/schema.py).
    package_data={"effnet_common": ["data/*.txt"]},
    install_requires=INSTALL_REQUIRES,
    # gcp-storage-emulator: a GCS JSON-API server the tests run beam_preprocess against (tests/gcs_emulator.py);
    # pytest-xdist: the suite runs on two workers (scripts/test.sh), a module's tests on one (``xdist_group``);
    # pytest: 9.1.1, not 9.2: 9.2 keeps a node's id where pytest-xdist 3.8 cannot add the group to it, and every
    # group is then ignored without a word (a module's fixtures built once on each worker; tests/test_suite_env.py
    # holds it). tensorboard-plugin-profile: TensorBoard's
    # Profile tab for --profile-steps traces, whose proto benchmarks/profile_step.py reads them with (the
    # release of the pinned TensorFlow's version).
    # tensorflow-datasets: only to read or write a tfds copy of ImageNet (beam_preprocess --tfds-data-dir
    # reads its records without it; benchmarks/preprocess.py and a test prepare one); it imports
    # importlib_resources without declaring it.
    # ruff: pinned so that every machine lints and formats alike (a ruff release changes the formatter's style
    # and adds rules; scripts/test.sh fails on any file the pinned release would format otherwise); moved to
    # the current release by hand, with the reformat it brings in a commit of its own.
    # mkdocs, mkdocs-material: the documentation site (mkdocs.yml), built with broken links as errors by
    # tests/test_docs.py; pinned like ruff, so that every machine builds and checks the docs alike.
    # ml-goodput-measurement: the library effnet_common/goodput.py follows, only for the test that checks our
    # calculator against it on one scripted record (tests/test_goodput_library.py); test-only, since it records
    # to Cloud Logging and pulls google-cloud-logging, held at 3.14.0 in constraints.txt (3.17 needs protobuf 6,
    # TFX protobuf 4.25).
    extras_require={
        "tfds": TFDS,
        "dev": [
            *TFDS,
            "pytest==9.1.1",
            "ruff==0.17.6",
            "gcp-storage-emulator==2026.7.19",
            "pytest-xdist==3.8.0",
            "tensorboard-plugin-profile==2.16.0",
            "mkdocs==1.6.1",
            "mkdocs-material==9.8.1",
            "ml-goodput-measurement==0.2.3",
        ],
    },
)
