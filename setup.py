"""Install tofu_tf: `pip install -e ".[cpu,test]"` (CPU) or `pip install -e ".[gpu,test]"` (GPU).

TensorFlow is an extra, not a hard requirement, so that a CPU user and a GPU user each get
exactly one TensorFlow wheel: `tensorflow-cpu` and `tensorflow[and-cuda]` install the same
`tensorflow` package and overwrite each other. A user who already has a TensorFlow 2.x wheel
installs with no TensorFlow extra at all.
"""

from setuptools import find_packages, setup

setup(
    name="tofu_tf",
    version="0.1.0",
    description="Partition every operator of a TensorFlow training graph across N devices.",
    packages=find_packages(include=["tofu_tf", "tofu_tf.*"]),
    package_data={"tofu_tf.cc": ["*.cc", "*.h", "BUILD"]},
    python_requires=">=3.10",
    install_requires=["numpy>=1.24", "absl-py>=1.4", "scipy>=1.11"],
    extras_require={
        "cpu": ["tensorflow-cpu>=2.16,<3"],
        "gpu": ["tensorflow[and-cuda]>=2.16,<3"],
        "test": ["pytest>=7", "hypothesis>=6"],
        "plot": ["matplotlib>=3.7"],
    },
)
