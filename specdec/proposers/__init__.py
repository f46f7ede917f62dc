from .base import Draft, ProposalContext, Proposer
from .draft_model import DraftModelProposer, check_compatible
from .ngram import NgramProposer

__all__ = ["Draft", "ProposalContext", "Proposer", "DraftModelProposer", "NgramProposer", "check_compatible"]
