"""torch-fidelity's InceptionV3 (`FeatureExtractorInceptionV3`, "inception-v3-compat"), whose weights from a local
file are checked to fit it before torch loads them: a file of other weights is said by its keys, naming the file,
where torch's `Error(s) in loading state_dict for FeatureExtractorInceptionV3` named neither. Imported only where
Inception features are built: torch-fidelity is an optional extra (`pip install -e ".[fid]"`)."""

from collections.abc import Mapping
from typing import Any

from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

from diffusion.errors import InvalidValue, WeightsDoNotFit, check_weights_fit

FEATURES = ["2048", "logits_unbiased"]  # the pool features (FID, KID) and the logits without bias (IS)


class InceptionV3(FeatureExtractorInceptionV3):
    """The network torch-fidelity builds, its weights downloaded (`source` None) or read from a local file, which
    `source` names (`{--inception_weights} PATH`) in the line refusing weights that do not fit, with `fix`."""

    def __init__(self, weights_path: str | None = None, source: str | None = None, fix: str = "") -> None:
        # set before torch-fidelity's __init__, which calls load_state_dict (plain values: nn.Module takes them)
        self.weights_source, self.weights_fix = source, fix
        super().__init__("inception-v3-compat", FEATURES, feature_extractor_weights_path=weights_path)

    def load_state_dict(self, state_dict: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        if self.weights_source is not None:
            try:
                check_weights_fit(self, state_dict, self.weights_source, self.weights_fix)
            except WeightsDoNotFit as misfit:  # a file the caller named: a ValueError, as its other faults
                raise InvalidValue(misfit.problem, misfit.fix) from None
        return super().load_state_dict(state_dict, *args, **kwargs)
