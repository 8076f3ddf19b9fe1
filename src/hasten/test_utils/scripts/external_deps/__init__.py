"""Training scripts with third-party dependencies (transformers, datasets), at the paths where Accelerate's backend
test suites launch them (``test_utils/scripts/external_deps/<name>.py``), with the same command-line arguments and
the same pass conditions, written for hasten.

By default they read what the reference's scripts read (models from the Hugging Face Hub, GLUE MRPC through
``datasets``), so they need the network. Two options of hasten's own make them run offline: ``--model_name_or_path``
(also on the scripts whose model the reference fixes) takes a local directory, and ``--dataset_dir`` (scripts on
MRPC) takes a folder with ``train.jsonl`` and ``validation.jsonl`` (``sentence1``, ``sentence2``, ``label``).
Accuracy is computed here, so ``evaluate`` is not needed.
"""
