// the text a model reads of an observation is the env layer's (its chat env writes it too)
export { observationText } from '../env/index.ts';
