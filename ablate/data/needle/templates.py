"""The needle's eight templates (drugs, vital signs, lab results, diagnoses, procedures, allergies, treatment
duration, symptoms), each a sentence with 2-4 slots filled from small lexicons, written for French clinical
text and again for English. The paper's design (Touchent & de la Clergerie 2026, needle in a haystack), in
ablate's own wording. A distractor fills every slot of the same template with another value, so each slot's
lexicon holds at least two values.

May import: nothing. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Template:
    name: str
    text: str  # str.format text, one {slot} per lexicon
    slots: tuple[tuple[str, tuple[str, ...]], ...]  # (slot, its values), in the text's order

    def fill(self, values: dict[str, str]) -> str:
        return self.text.format(**values)


def _t(name: str, text: str, **slots: tuple[str, ...]) -> Template:
    return Template(name, text, tuple(slots.items()))


DOSES = ("5", "10", "20", "40", "50", "100", "250", "500")
DAYS = ("2", "3", "4", "5", "6", "7", "9", "12")

FRENCH = (
    _t(
        "drugs",
        "Le patient a reçu {drug} à la dose de {dose} mg par voie {route}, {frequency}.",
        drug=(
            "de l'amoxicilline",
            "du paracétamol",
            "de la furosémide",
            "de l'énoxaparine",
            "du métoprolol",
            "de la ceftriaxone",
            "du tramadol",
            "de l'oméprazole",
        ),
        dose=DOSES,
        route=("orale", "intraveineuse", "sous-cutanée", "intramusculaire"),
        frequency=("une fois par jour", "deux fois par jour", "trois fois par jour", "toutes les six heures"),
    ),
    _t(
        "vital_signs",
        "À l'admission, la pression artérielle était de {systolic}/{diastolic} mmHg et la fréquence "
        "cardiaque de {pulse} battements par minute.",
        systolic=("95", "110", "124", "138", "152", "167", "181"),
        diastolic=("55", "62", "70", "78", "85", "93", "104"),
        pulse=("48", "61", "74", "88", "102", "117", "131"),
    ),
    _t(
        "lab_results",
        "Au jour {day} de l'hospitalisation, le dosage {analyte} était à {value} fois la limite "
        "supérieure de la normale.",
        day=DAYS,
        analyte=(
            "de la créatinine",
            "de la CRP",
            "de la troponine",
            "de la lipase",
            "des ALAT",
            "de la ferritine",
            "des LDH",
            "des CPK",
        ),
        value=("1,5", "2", "3", "4", "6", "8", "10", "15"),
    ),
    _t(
        "diagnoses",
        "Le diagnostic de {diagnosis} a été retenu chez ce patient âgé de {age} ans.",
        diagnosis=(
            "pneumopathie communautaire",
            "pyélonéphrite aiguë",
            "embolie pulmonaire",
            "sarcoïdose",
            "endocardite infectieuse",
            "maladie de Crohn",
            "lupus érythémateux systémique",
            "insuffisance cardiaque",
        ),
        age=("23", "31", "38", "45", "52", "59", "66", "74", "81"),
    ),
    _t(
        "procedures",
        "Une {procedure} a été réalisée sous {anaesthesia} le {day} {month}.",
        procedure=(
            "appendicectomie",
            "cholécystectomie",
            "coloscopie",
            "gastroscopie",
            "biopsie hépatique",
            "ponction lombaire",
            "thyroïdectomie",
            "coronarographie",
        ),
        anaesthesia=("anesthésie générale", "anesthésie locale", "rachianesthésie", "sédation légère"),
        day=("3", "8", "11", "14", "17", "21", "26", "29"),
        month=("janvier", "mars", "avril", "juin", "août", "octobre", "novembre"),
    ),
    _t(
        "allergies",
        "Le patient rapporte une allergie {allergen} qui avait provoqué {reaction}.",
        allergen=(
            "à la pénicilline",
            "à l'aspirine",
            "aux sulfamides",
            "à l'iode",
            "au latex",
            "à la codéine",
            "aux arachides",
            "à l'ibuprofène",
        ),
        reaction=(
            "une urticaire généralisée",
            "un œdème de Quincke",
            "un choc anaphylactique",
            "un bronchospasme",
            "une éruption cutanée",
            "des vomissements",
        ),
    ),
    _t(
        "treatment_duration",
        "Le traitement par {drug} a été poursuivi pendant {count} {unit}.",
        drug=(
            "corticoïdes",
            "antivitamine K",
            "méthotrexate",
            "isoniazide",
            "lithium",
            "insuline",
            "amiodarone",
            "vancomycine",
        ),
        count=("2", "3", "4", "6", "8", "10", "12"),
        unit=("jours", "semaines", "mois"),
    ),
    _t(
        "symptoms",
        "Le patient consultait pour {symptom} évoluant depuis {count} jours, d'intensité {intensity}.",
        symptom=(
            "une douleur thoracique",
            "une dyspnée",
            "des céphalées",
            "une fièvre",
            "des douleurs abdominales",
            "une toux sèche",
            "des vertiges",
            "une asthénie",
        ),
        count=DAYS,
        intensity=("légère", "modérée", "sévère"),
    ),
)

ENGLISH = (
    _t(
        "drugs",
        "The patient was given {drug} {dose} mg {route}, {frequency}.",
        drug=(
            "amoxicillin",
            "paracetamol",
            "furosemide",
            "enoxaparin",
            "metoprolol",
            "ceftriaxone",
            "tramadol",
            "omeprazole",
        ),
        dose=DOSES,
        route=("orally", "intravenously", "subcutaneously", "intramuscularly"),
        frequency=("once a day", "twice a day", "three times a day", "every six hours"),
    ),
    _t(
        "vital_signs",
        "On admission, blood pressure was {systolic}/{diastolic} mmHg and heart rate was {pulse} "
        "beats per minute.",
        systolic=("95", "110", "124", "138", "152", "167", "181"),
        diastolic=("55", "62", "70", "78", "85", "93", "104"),
        pulse=("48", "61", "74", "88", "102", "117", "131"),
    ),
    _t(
        "lab_results",
        "On day {day} of the hospital stay, {analyte} was {value} times the upper limit of normal.",
        day=DAYS,
        analyte=(
            "serum creatinine",
            "C-reactive protein",
            "troponin",
            "lipase",
            "alanine aminotransferase",
            "ferritin",
            "lactate dehydrogenase",
            "creatine kinase",
        ),
        value=("1.5", "2", "3", "4", "6", "8", "10", "15"),
    ),
    _t(
        "diagnoses",
        "A diagnosis of {diagnosis} was made in this {age}-year-old patient.",
        diagnosis=(
            "community-acquired pneumonia",
            "acute pyelonephritis",
            "pulmonary embolism",
            "sarcoidosis",
            "infective endocarditis",
            "Crohn's disease",
            "systemic lupus erythematosus",
            "heart failure",
        ),
        age=("23", "31", "38", "45", "52", "59", "66", "74", "81"),
    ),
    _t(
        "procedures",
        "The patient underwent {procedure} under {anaesthesia} on {month} {day}.",
        procedure=(
            "appendectomy",
            "cholecystectomy",
            "colonoscopy",
            "upper endoscopy",
            "liver biopsy",
            "lumbar puncture",
            "thyroidectomy",
            "angiography",
        ),
        anaesthesia=("general anaesthesia", "local anaesthesia", "spinal anaesthesia", "light sedation"),
        day=("3", "8", "11", "14", "17", "21", "26", "29"),
        month=("January", "March", "April", "June", "August", "October", "November"),
    ),
    _t(
        "allergies",
        "The patient reports an allergy to {allergen}, which had caused {reaction}.",
        allergen=("penicillin", "aspirin", "sulfonamides", "iodine", "latex", "codeine", "peanuts", "ibuprofen"),
        reaction=(
            "generalised urticaria",
            "angioedema",
            "anaphylactic shock",
            "bronchospasm",
            "a skin rash",
            "vomiting",
        ),
    ),
    _t(
        "treatment_duration",
        "Treatment with {drug} was continued for {count} {unit}.",
        drug=(
            "corticosteroids",
            "warfarin",
            "methotrexate",
            "isoniazid",
            "lithium",
            "insulin",
            "amiodarone",
            "vancomycin",
        ),
        count=("2", "3", "4", "6", "8", "10", "12"),
        unit=("days", "weeks", "months"),
    ),
    _t(
        "symptoms",
        "The patient presented with {symptom} of {count} days' duration, {intensity} in intensity.",
        symptom=(
            "chest pain",
            "dyspnoea",
            "headache",
            "fever",
            "abdominal pain",
            "a dry cough",
            "dizziness",
            "fatigue",
        ),
        count=DAYS,
        intensity=("mild", "moderate", "severe"),
    ),
)

TEMPLATES: dict[str, tuple[Template, ...]] = {"fr": FRENCH, "en": ENGLISH}
