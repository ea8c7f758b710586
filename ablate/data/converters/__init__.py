"""Converters: a dataset's downloaded source files -> its shipped files, one function per derivation each
dataset's SOURCE.md describes, named in ablate/data/catalog.yaml. A converter takes (inputs: source name ->
downloaded path, out: an empty folder, the catalog entry) and writes every file the manifest lists.

May import: config, data.
"""

from __future__ import annotations

from functools import partial

from ablate.data.converters.articles import convert_craft
from ablate.data.converters.blue import convert_blue_chemprot
from ablate.data.converters.blurb import convert_biosses, convert_gad, convert_hoc, convert_jnlpba
from ablate.data.converters.brat import convert_mantra, convert_quaero, convert_quaero_brat
from ablate.data.converters.coded_documents import convert_fracco, convert_frasimed
from ablate.data.converters.common import convert_copy
from ablate.data.converters.ddi import convert_ddi
from ablate.data.converters.diamed import convert_diamed
from ablate.data.converters.deid import convert_physionet_deid
from ablate.data.converters.e3c_corpus import convert_corpus_en_e3c, convert_corpus_fr_e3c
from ablate.data.converters.leaflets import convert_leaflets
from ablate.data.converters.medquad import convert_medquad
from ablate.data.converters.needle import convert_needle
from ablate.data.converters.others import convert_e3c_fr_ner, convert_morfitt, convert_pubmedqa
from ablate.data.converters.uw_brat import convert_uw_brat

CONVERTERS = {
    "copy": convert_copy,
    "jnlpba": convert_jnlpba,
    "gad": convert_gad,
    "biosses": convert_biosses,
    "hoc": convert_hoc,
    "morfitt": convert_morfitt,
    "pubmedqa_pqal": convert_pubmedqa,
    "e3c_fr_ner": convert_e3c_fr_ner,
    "corpus_en_e3c": convert_corpus_en_e3c,
    "corpus_fr_e3c": convert_corpus_fr_e3c,
    "ddi": convert_ddi,
    "corpus_en_craft": convert_craft,
    "corpus_en_medquad": convert_medquad,
    "corpus_fr_leaflets_e3c": convert_leaflets,
    "quaero": convert_quaero,
    "quaero_brat": convert_quaero_brat,
    "mantragsc_fr": convert_mantra,
    "diamed": convert_diamed,
    "fracco_30": partial(convert_fracco, top_k=30),
    "fracco_100": partial(convert_fracco, top_k=100),
    "cantemist": partial(convert_frasimed, subset="cantemist"),
    "distemist": partial(convert_frasimed, subset="distemist"),
    "blue_chemprot": convert_blue_chemprot,
    "uw_brat": convert_uw_brat,
    "physionet_deid": convert_physionet_deid,
    "needle": convert_needle,
}
