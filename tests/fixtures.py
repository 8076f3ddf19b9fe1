"""Small objects several test files need: a checkpointable counter and iterable data sets."""
from torch.utils.data import IterableDataset


class Counter:
    """Anything with state_dict / load_state_dict, as register_for_checkpointing takes."""

    def __init__(self, value=0):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


class Numbers(IterableDataset):
    """0 .. length-1 as an iterable data set that knows its length."""

    def __init__(self, length):
        self.length = length

    def __iter__(self):
        return iter(range(self.length))

    def __len__(self):
        return self.length


class ResumableStream(IterableDataset):
    """An iterable data set with its own position (state_dict / load_state_dict); counts what it reads."""

    def __init__(self, length):
        self.length = length
        self.position = 0
        self.reads = 0

    def __iter__(self):
        while self.position < self.length:
            self.position += 1
            self.reads += 1
            yield self.position - 1
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]
