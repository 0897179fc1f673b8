"""Privacy budgets and the per-run ledger of what every client released."""

from privfed.privacy.budget import PrivacyPlan, plan_privacy
from privfed.privacy.ledger import PrivacyLedger

__all__ = ["PrivacyLedger", "PrivacyPlan", "plan_privacy"]
