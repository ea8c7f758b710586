"""ablate: layer-freezing ablations of encoder continued pretraining.

Each stage's package says what it owns and what it may import (docs/architecture.md); a module's own docstring
narrows that where it imports less (tests/test_architecture.py checks every "May import:" line).

May import: nothing of ablate.
"""

__version__ = "0.1.0"
