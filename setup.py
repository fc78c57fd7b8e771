"""bertjax: pretraining BERT-family encoders in JAX/Flax."""

import setuptools

_BEAM = ['apache-beam>=2.60,<3']
_TPU_AOT = ['jax[tpu]>=0.10,<0.11']

setuptools.setup(
    name='bertjax',
    version='0.1.0',
    description='Pretraining BERT-family encoders in JAX/Flax on CPUs, GPUs '
                'and TPU pods.',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=setuptools.find_packages(include=['bertjax', 'bertjax.*',
                                               'data_pipelines',
                                               'data_pipelines.*']),
    # Data read at run time: the discourse markers list
    # (data_pipelines/discourse.py).
    package_data={'data_pipelines': ['data/*.txt']},
    python_requires='>=3.10',
    # Ranges start at the versions the test suite was run with.
    install_requires=[
        'jax>=0.10,<0.11',
        'flax>=0.12,<0.13',
        'optax>=0.2.6,<0.3',
        'orbax-checkpoint>=0.12,<0.13',
        # Below 0.2.3: its generated model proto refuses a protobuf older
        # than 7.36, which Beam (the 'beam' extra) cannot take, and it trains
        # other models from the same text; one version for every install
        # keeps a config's tokenizer the same bytes.
        'sentencepiece>=0.2,<0.2.3',
        'tensorflow-datasets>=4.9.9,<5',
        # TFDS builders import it when writing ArrayRecord without TensorFlow.
        'importlib_resources>=6',
        'ml-collections>=1.1,<2',
        'grain>=0.2.15,<0.3',
        'array-record>=0.8,<0.9',
        'numpy>=2,<3',
        'tensorboardX>=2.6,<3',
        'absl-py>=2,<3',
        # Hugging Face exports and imports (bertjax/interop/hf_convert.py), no torch.
        'safetensors>=0.4,<1',
        # The exported tokenizer.json (bertjax/interop/hf_tokenizer.py); the
        # SentencePiece model is read through its protobuf.
        'tokenizers>=0.20,<1',
        'protobuf>=4.21,<8',
        # Pearson/Spearman of the downstream tasks (data_pipelines/downstream).
        'scipy>=1.11,<2',
        # Accuracy, F1 and Matthews correlation of the downstream tasks.
        'scikit-learn>=1.9,<2',
        'tqdm>=4.66,<5',
        # zstd-compressed corpus files, read as streams (data_pipelines/corpus.py).
        'zstandard>=0.22,<1',
        # gs:// paths (bertjax/storage.py): fsspec's Cloud Storage client.
        'gcsfs>=2024.6,<2027',
        # Q8BERT's 8-bit quantization-aware training and int8 inference
        # (bertjax/quantization.py). Below 0.2: bertjax reads its providers'
        # WithAux and QArray, which a minor release may move.
        'qwix>=0.1.8,<0.2',
    ],
    extras_require={
        # torch: transformers runs the exported models in the tests; the
        # upper bound admits the CPU build that 2.13.0 ships as.
        # pytest-xdist: the suite runs on two workers (README's command).
        # gcp-storage-emulator: the Cloud Storage API the gs:// tests use.
        'test': ['pytest>=8,<10', 'pytest-xdist>=3.6,<4',
                 'hypothesis>=6.100,<7', 'scipy>=1.11,<2',
                 'matplotlib>=3.9,<4', 'torch>=2.6,<=2.13.0',
                 'transformers>=5,<6', 'gcp-storage-emulator>=2024.8,<2027',
                 *_BEAM, *_TPU_AOT],
        # The TPU compiler, for python -m bertjax.preflight on any x86-64
        # Linux host: jax's own extra, so libtpu is the installed jax's pair.
        'tpu-aot': _TPU_AOT,
        # Preparing a corpus as an Apache Beam pipeline
        # (data_pipelines/beam.py; python -m data_pipelines.prepare
        # --runner=beam).
        'beam': _BEAM,
        # experiments/compare.py's plots.
        'compare': ['matplotlib>=3.9,<4'],
        # Peers measured side by side in experiments/benchmarks/.
        'bench': ['torch>=2.6,<3', 'transformers>=5,<6'],
    },
    entry_points={
        'console_scripts': ['bertjax-train=bertjax.train:run'],
    },
)
