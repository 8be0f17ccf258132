"""The models, one module per concept; importing this package registers them all."""

from models.api_key import ApiKey
from models.bootstrap_token import BootstrapToken
from models.brand import Brand

__all__ = ["ApiKey", "BootstrapToken", "Brand"]
