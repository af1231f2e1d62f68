# torch_neuronx: the import name that Neuron's PyTorch docs, Hugging Face transformers and
# accelerate use for the native "neuron" device (they probe `find_spec("torch_neuronx")`, import
# it, then use `torch.neuron`). It is not a second backend: importing it runs openneuron's
# registration (idempotent with the `import torch` autoload) and exposes nothing else; the device
# surface is torch.neuron (openneuron/neuron/). Not the XLA-based torch-neuronx: no torch_xla.
import openneuron as _openneuron

__version__ = _openneuron.__version__
__all__ = ["__version__"]
